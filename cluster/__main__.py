import sys

from megdet.cluster.cli import main

sys.exit(main())
