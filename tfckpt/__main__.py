import sys

from tfckpt.cli import main

sys.exit(main())
