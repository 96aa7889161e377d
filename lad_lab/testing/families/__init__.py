"""The tiny builds of the families the service has an adapter for (``app.models``), one
module per adapter module: the real transformers classes, shapes and processors laid out
by hand as each family's tests pin them (``lad_lab.testing.tiny_models`` is their registry)."""
