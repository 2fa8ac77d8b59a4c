from meshant.cli import main

main()
