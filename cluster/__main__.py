import sys

from megdet.cluster.control_plane import main

sys.exit(main())
