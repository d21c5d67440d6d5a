"""The submitting side: compose and check a run, then start its ranks or submit it (imports no torch)."""
