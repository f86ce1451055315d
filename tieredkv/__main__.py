from tieredkv.launch import run

run()
