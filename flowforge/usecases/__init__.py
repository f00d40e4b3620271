"""Use cases: units of work composed over the store, in the order of one operation."""
