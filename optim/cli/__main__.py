import sys

from optim.cli.main import main

sys.exit(main())
