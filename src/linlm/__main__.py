import sys

from linlm.cli import main

sys.exit(main())
