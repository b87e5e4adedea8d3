"""Assignment 01, data parallelism: reference solutions and mutants.

    ddp.py      all_reduce_gradients, BucketedDDP (buckets all-reduced during backward, no_sync), the ZeRO ledger
    zero.py     ZeroShardedOptimizer: the ZeRO step for any torch optimizer
    fsdp.py     fully_shard / gather_full_params: FSDP (ZeRO-3) with mixed precision
    mutants.py  plausible wrong edits of the answer cells, and correct variants (VARIANTS)

Cut into source/01_data_parallel/ by assignments/01_data_parallel/_build_nb.py.
"""
