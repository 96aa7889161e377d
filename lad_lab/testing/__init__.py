"""The lab's test support: tiny random MLLMs of any served model type with processors built in
code (``tiny_models``: the registry every caller imports; ``families``, ``generic`` and
``tiny_base`` below it), random models of released shapes (``shapes``), the model matrix
(``matrix``), ``lad model tiny`` (``tiny_cli``) and hostile requests (``hostile``)."""
