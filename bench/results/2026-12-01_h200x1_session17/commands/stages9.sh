# Call 9, one H200: the ticket loop as a for loop of the even share (+1) then a while loop.
TAILN=30 run loops2 200 python bench/probe_ws.py --shapes 4096x1792x8192,16384x512x8192,8192x1792x8192 --configs 128x256x64x3x8
