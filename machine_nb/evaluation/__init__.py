"""Evaluation: sampling eval rows, scoring, results, comparisons and their statistics, a machine's
cases, held-out evals during training, the promotion gate, and Inspect AI interop.
"""
