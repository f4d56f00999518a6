"""Moving the trainer's weights into the vLLM engines after every optimizer step:
`interfaces.WeightSync` (what a sync does), `factory.make_weight_sync` (which one a config
selects), `object_store` (CPU engines) and `collective` (a broadcast over the `transports`:
NCCL on GPUs, not run on the build machine; gloo on CPUs, run in its tests)."""
