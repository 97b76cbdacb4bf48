import sys

from quantverdict.run.cli import main

sys.exit(main())
