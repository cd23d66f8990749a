import sys

from vllmx.cli.main import main

sys.exit(main())
