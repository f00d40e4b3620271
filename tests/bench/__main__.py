"""`python -m tests.bench`, what bin/bench runs once the venv and services are up."""

import sys

from tests.bench.bench import main

sys.exit(main())
