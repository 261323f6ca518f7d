"""graft: teach a post-trained LLM a new task by grafting a donor-learned, Fisher-masked update.

The package is the small typed core: pure functions over tensors, tables and model directories.
DVC stages (``stages/``) only load params, call these functions and write outputs atomically.
"""

from graft.openmp import wait_politely

wait_politely()   # before anything imports torch (graft.openmp says why)
