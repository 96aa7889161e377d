"""The demo model's synthetic world and training recipe (the shipped weights are package
data of the service: ``app/models/demo/``)."""
