"""Moving the trainer's weights into the vLLM engines after every optimizer step."""
from rltf_ray.weight_sync.interfaces import WeightSync, make_weight_sync

__all__ = ["WeightSync", "make_weight_sync"]
