"""Scheduling: a tensor graph -> kernels. normalize.py (the cache key), fusion.py (which nodes get a
kernel), template.py (the steps, cached), indexing.py (kernel IR per realize point), overwrites.py and
computed.py (values fixed before writes, values kept between realizes)."""
