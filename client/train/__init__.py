"""The training loop: the small reference detector (``detect/``), its CUDA-graph training
step (``step``), the feeder that stages batches into the step's static buffers (``feeder``),
``fit`` and its settings (``fit_config``), checkpoints and run folders (``checkpoint``,
``run_dir``). ``pixpool train`` and ``pixpool demo`` (``cli/``) are its faces.

Runs in a trainer's process and needs the ``train`` extra (torch). It reads batches through
the stream client one level up (``client.loader``); nothing of the stream client depends on
it.
"""
