"""The workflow's commands beside `run`, `eval` and `check`, each a `main(argv)` that the
installed `rltf-ray <command>` and a checkout's `python pipelines/<command>.py` both call:
warmstart, compare, report, plot and example."""
