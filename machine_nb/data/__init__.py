"""Machine's workspace as data: runs as DataFrames, selecting runs, exporting them as chat rows, the
arithmetic corpus.
"""
