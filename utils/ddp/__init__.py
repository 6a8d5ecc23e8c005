"""Launch plumbing for the distributed programs of notebooks 08 and 09.
Used by notebooks 08 and 09 (through :mod:`utils.ddp.common`).

The smallest program (``hello``: three collectives), the DDP program, the hand-written SyncBatchNorm and
the ring all-reduce are written *in* notebook 08,
the FSDP2, checkpoint and tensor-parallel programs in notebook 09 (``%%writefile`` cells into
``notebooks/runs/``); what lives here is what those programs share:

* :mod:`utils.ddp.common`: joining and always destroying the process group (``distributed()``),
  ``[rank N]`` report lines, result files (``save_result``) read back with
  ``utils.launch.load_rank_results``;
* :mod:`utils.ddp.exercise`: the model, the data and the bookkeeping of notebook 08's exercise 4, a DDP program the
  learner completes and its check launches.
"""
