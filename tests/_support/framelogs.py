"""Frame-log files seen from a test: what the writer did during the run, not only what
the files hold at the end.

A writer flushes every ``flush_interval`` (1 s) and each flush is one Parquet row group
(docs/design.md, "Frame log"). A writer that died half-way and left everything to the
final flush at close writes the same rows — one row group per file — so a test of a run
longer than the interval checks :func:`flushes` too: more row groups than files means
the writer was writing while the run went on.
"""

import glob
import os

__all__ = ["parquet_files", "flushes"]


def parquet_files(directory, source):
    """Finished Parquet files of ``source`` (``proxy`` or ``client``) in ``directory``."""
    return sorted(glob.glob(os.path.join(str(directory), f"{source}-*.parquet")))


def flushes(directory, source):
    """(files, row groups) of ``source``'s finished Parquet files in ``directory``."""
    import pyarrow.parquet as pq
    files = parquet_files(directory, source)
    return len(files), sum(pq.ParquetFile(f).num_row_groups for f in files)
