import numpy as np, sys, json, os, shutil
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst, exist_ok=True)
m = json.load(open(src + '/manifest.json'))
for f in os.listdir(src):
    if f.endswith('.k.npy') or f.endswith('.kdec.npy'):
        continue
    shutil.copy(src + '/' + f, dst + '/' + f)
for L in m['layers']:
    k = np.load(f'{src}/layer{L:02d}.k.npy')
    mu = k.astype(np.float32).mean(1, keepdims=True)  # per KV head, over prefill positions
    np.save(f'{dst}/layer{L:02d}.k.npy', (k.astype(np.float32) - mu).astype(k.dtype))
    kd = np.load(f'{src}/layer{L:02d}.kdec.npy')
    np.save(f'{dst}/layer{L:02d}.kdec.npy', (kd.astype(np.float32) - mu).astype(kd.dtype))
print('centered', m['layers'])
