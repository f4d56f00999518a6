"""rltf_ray: reinforcement learning from text feedback on Ray (see README.md)."""
__version__ = "0.1.0"
