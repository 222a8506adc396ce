"""Shared test set-up: offline, single-threaded torch, small fixtures."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MACHINE_NB_PROGRESS", "0")
