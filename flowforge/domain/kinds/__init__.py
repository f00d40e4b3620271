"""One module per step kind, each behind the small interface of `kinds/base.py` that the
engine's core (flowforge/domain/engine.py) calls."""
