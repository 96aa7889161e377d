"""The generic tiny builder: a tiny random instance of any model type of transformers'
image-text-to-text mapping, with no family named (``build.build``; its steps are the other
modules here, each listed in ``build``'s docstring)."""
