"""Evaluation core (DESIGN §2.7): orderings, accuracy, RStd, consistency, confusion.

    protocol  T orderings per item (identity + T-1 distinct random permutations, seeded
              per item), apply_ordering, gt_positions, chosen_images
    metrics   accuracy_per_ordering, recall_per_position, recall_std (RStd), consistency
              (Cons), confusion_matrix, evaluate_predictions -> MethodResult
    report    results_table / confusion_table (Markdown or plain text)

Pure functions over arrays of predicted positions (items x orderings); the model-facing
loop lives in the callers (``app.demo.evaluate`` for the demo model card).
"""
