"""graft: teach a post-trained LLM a new task by grafting a donor-learned, Fisher-masked update.

The package is the small typed core: pure functions over tensors, tables and model directories.
DVC stages (``stages/``) only load params, call these functions and write outputs atomically.
"""
