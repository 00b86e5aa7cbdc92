import sys

from megdet.cli import main

sys.exit(main())
