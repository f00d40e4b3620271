"""PostgreSQL as the truth: pools and settings, migrations, and one module per thing it
owns, as named statements and units of work."""
