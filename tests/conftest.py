"""Shared test set-up: offline, single-threaded torch, small fixtures."""

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MACHINE_NB_PROGRESS", "0")
# the local Tinker server writes runs and checkpoints here, not into the user's cache
os.environ.setdefault("MACHINE_NB_DATA_DIR", tempfile.mkdtemp(prefix="machine-nb-server-"))
# and run indexes go here, never into the user's cache
os.environ.setdefault("MACHINE_NB_CACHE_DIR", tempfile.mkdtemp(prefix="machine-nb-cache-"))
