"""The CUDA path proven in one prepared run (`scripts/gpu_check.sh`, `python -m fluidpd.bench.gpu_check`).

Each check is a part registered in `CHECKS` under its name and run in order by `run_checks`,
each within its share of one time budget, each writing its figures into one JSON record:

  imports    every package the engine and the server need imports (versions recorded)
  engine     the engine's device test subset (`tests/engine/test_engine_on_device.py --device D`)
  generate   `fluidpd generate --device D` on a random-weight model of Llama-3.1-8B's shape, written
             on the spot, against transformers' greedy tokens on the same device
  serve      `fluidpd serve --device D`, two in-process workers sharing the device: a streamed
             request through a forced role switch, no token lost
  steps      prefill and decode step times of the 8B shape against the simulator's latency model for
             this GPU, and the measured profile the simulator can load

`--device cpu --tiny` is the dry run the test suite runs, so the script cannot rot between GPU runs.
"""
