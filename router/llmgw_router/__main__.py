from llmgw_router.main import main

main()
