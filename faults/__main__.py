import sys

from faults.runner import main

sys.exit(main())
