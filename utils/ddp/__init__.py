"""Distributed-training scripts of notebook 08, each runnable by ``torchrun``.

Run one the way a user would (from the repository root)::

    torchrun --standalone --nproc_per_node=2 -m utils.ddp.hello
    torchrun --standalone --nproc_per_node=2 -m utils.ddp.train --epochs 3 --out runs/ddp
    torchrun --standalone --nproc_per_node=2 -m utils.ddp.syncbn --out runs/syncbn
    torchrun --standalone --nproc_per_node=4 -m utils.ddp.ring_allreduce --out runs/ring

or from Python with :func:`utils.launch.run_torchrun`. Every script prints ``[rank N] ...`` lines
(:func:`utils.ddp.common.report`), may write its results to ``--out DIR/rank<N>.pt``, and always
destroys its process group on the way out (:func:`utils.ddp.common.distributed`).
"""
