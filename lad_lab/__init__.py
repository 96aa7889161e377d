"""The lab of lad-serve, beside the service and never imported by it (``pip install
'lad-serve[lab]'``; ``scripts/dev setup dev`` installs it): the evaluation harness
(``lad eval``), the benchmarks (``lad bench``), the demo model's world and training
(``lad demo train``; the trained model itself ships with the service, ``app/models/demo/``),
and the tiny and real-shape test models of every served type (``lad model tiny``)."""
