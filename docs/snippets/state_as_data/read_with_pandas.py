"""A savepoint read with pandas (pyarrow) from its files alone: `python read_with_pandas.py SAVEPOINT`."""

import sys

import pandas as pd

counts = pd.read_parquet(f"{sys.argv[1]}/stores/counts")  # Hive partitions: a `partition` column
print(counts[["partition", "key", "value"]].sort_values("value", ascending=False).head(3).to_string(index=False))
print("clicks:", counts["value"].sum())
