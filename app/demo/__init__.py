"""The bundled demo model: synthetic world, training recipe and shipped weights."""
