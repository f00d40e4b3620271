"""Secrets and signatures: sealing at rest, webhook signatures and provider presets, which
workflow may use which secret."""
