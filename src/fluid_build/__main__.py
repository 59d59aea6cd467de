from fluid_build.cli import main

raise SystemExit(main())
