from topoalloc.cli import main

main()
