"""Step types with remote effects; pure steps (transform, delay) live in the engine."""
