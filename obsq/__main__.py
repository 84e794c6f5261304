import sys

from obsq.cli import main

sys.exit(main())
