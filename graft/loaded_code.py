"""Which of the project's code a process runs. Keys of reusable work (a finetune's resume checkpoint, an evaluated
point) include it, so work done by other code is never reused."""
from __future__ import annotations

import sys


def loaded_modules() -> dict[str, str]:
    """name -> file of every graft and stages module loaded in this process, sorted by name. The stage entry point
    (``python -m stages.<name>``, loaded as ``__main__``) counts under its own name: it holds stage logic too."""
    out = {}
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None)
        if name == "__main__":
            spec = getattr(mod, "__spec__", None)
            name = spec.name if spec is not None else name
        if f and f.endswith(".py") and name.split(".")[0] in ("graft", "stages"):
            out[name] = f
    return dict(sorted(out.items()))
