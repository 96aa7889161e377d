"""The one evaluation harness of the project (``lad eval``, DESIGN §2.7).

config       EvalConfig: every setting of a run, each field also its --flag (default, help)
cli          the command: the parser generated from EvalConfig, load the model, run
harness      one run per (n, setting): datasets -> calibration -> orderings -> methods
             -> predictions.jsonl, calibration.json, metrics.json, report.md, plots
datasets/    one reader each: synthetic (the demo world), jsonl, coco, flickr; CLIP
             nearest neighbours for adversarial negatives
protocol     balanced orderings (the GT at every position equally often)
evidence     batched forwards, calibration and the records of every method (the engine's
             calibration build and method dispatch; generation for cot/self_consistency)
records      the prediction record (the keys of predictions.jsonl) and its arrays
metrics      metrics.json from the records alone; stats: bootstrap, noise floor, ROC-AUC;
             diagnostics: AUC per position, agd vs attn_pure, κ̂, the prior per layer
plots, report  the figures and report.md from metrics.json
"""
