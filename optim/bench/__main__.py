import sys

from optim.bench.main import main

sys.exit(main())
