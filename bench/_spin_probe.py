import torch, triton.testing as tt, sys
from optwin.kernels.layernorm_welford import _welford_launch
from optwin.kernels.sketch_buffer import new_buffer, read_sketch
x=torch.randn(4096,16384,device="cuda",dtype=torch.bfloat16); w=torch.randn(16384,device="cuda",dtype=torch.bfloat16); b=torch.randn_like(w); y=torch.empty_like(x)
res={}
for p in (8,136,8,136):
    buf=new_buffer("layernorm",x.device)
    _welford_launch(x,w,b,y,buf,1e-5,probe=p); torch.cuda.synchronize()
    print(p,"ok",read_sketch("layernorm",buf)["rms"],flush=True)
    res.setdefault(p,[]).append(tt.do_bench(lambda: _welford_launch(x,w,b,y,buf,1e-5,probe=p),warmup=10,rep=60,return_mode="median")*1e3)
    print(p,res[p],flush=True)
