import sys

from agent.faults.runner import main

sys.exit(main())
