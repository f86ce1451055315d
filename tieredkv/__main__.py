import sys

from tieredkv.cli.main import main

sys.exit(main())
