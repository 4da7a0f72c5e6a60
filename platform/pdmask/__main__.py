from pdmask.cli import main

main()
