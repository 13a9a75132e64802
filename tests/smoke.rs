use rand::{Rng, SeedableRng};
use sdpa::{Alignment, Options, Tensor, TensorMut};

fn check(
    b: usize,
    h: usize,
    hkv: usize,
    nq: usize,
    nkv: usize,
    dk: usize,
    dv: usize,
    opts: Options,
) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut gen = |n: usize| {
        (0..n)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect::<Vec<_>>()
    };
    let q = gen(b * nq * h * dk);
    let k = gen(b * nkv * hkv * dk);
    let v = gen(b * nkv * hkv * dv);
    let qt = Tensor::bshd(&q, [b, nq, h, dk]).unwrap();
    let kt = Tensor::bshd(&k, [b, nkv, hkv, dk]).unwrap();
    let vt = Tensor::bshd(&v, [b, nkv, hkv, dv]).unwrap();
    let mut o1 = vec![0.0; b * nq * h * dv];
    let mut o2 = vec![0.0; b * nq * h * dv];
    let mut l1 = vec![0.0; b * h * nq];
    let mut l2 = vec![0.0; b * h * nq];
    sdpa::attention_lse(
        &qt,
        &kt,
        &vt,
        &mut TensorMut::bshd(&mut o1, [b, nq, h, dv]).unwrap(),
        &mut l1,
        &opts,
    )
    .unwrap();
    sdpa::reference::attention_lse(
        &qt,
        &kt,
        &vt,
        &mut TensorMut::bshd(&mut o2, [b, nq, h, dv]).unwrap(),
        &mut l2,
        &opts,
    )
    .unwrap();
    let bounds = sdpa::reference::error_bounds(&qt, &kt, &vt, &opts).unwrap();
    let mut worst = 0.0f64;
    for bb in 0..b {
        for i in 0..nq {
            for hh in 0..h {
                let row = (bb * h + hh) * nq + i;
                for c in 0..dv {
                    let idx = ((bb * nq + i) * h + hh) * dv + c;
                    let e = (o1[idx] as f64 - o2[idx] as f64).abs();
                    worst = worst.max(e / bounds[row].out.max(1e-30));
                    assert!(
                        e <= bounds[row].out,
                        "out mismatch at b{bb} i{i} h{hh} c{c}: {} vs {} bound {}",
                        o1[idx],
                        o2[idx],
                        bounds[row].out
                    );
                }
                let le = if l1[row] == l2[row] {
                    0.0
                } else {
                    (l1[row] as f64 - l2[row] as f64).abs()
                };
                assert!(
                    le <= bounds[row].lse,
                    "lse mismatch at b{bb} i{i} h{hh}: {} vs {} bound {}",
                    l1[row],
                    l2[row],
                    bounds[row].lse
                );
            }
        }
    }
    eprintln!("shape {b} {h} {hkv} {nq} {nkv} {dk} {dv}: worst err/bound {worst:.3e}");
}

#[test]
fn smoke() {
    check(1, 1, 1, 3, 3, 2, 2, Options::new());
    check(1, 2, 1, 65, 63, 17, 9, Options::new());
    check(
        2,
        4,
        2,
        130,
        200,
        64,
        64,
        Options::new().causal(Alignment::TopLeft),
    );
    check(
        1,
        8,
        1,
        7,
        300,
        128,
        80,
        Options::new().causal(Alignment::BottomRight),
    );
    check(
        1,
        3,
        3,
        300,
        100,
        3,
        1,
        Options::new().causal(Alignment::TopLeft),
    );
    check(
        1,
        3,
        3,
        300,
        100,
        8,
        256,
        Options::new().causal(Alignment::BottomRight),
    );
    check(1, 1, 1, 5, 0, 8, 8, Options::new());
}

#[test]
fn smoke_variants() {
    let slopes8 = sdpa::alibi_slopes(8);
    let sinks8: Vec<f32> = (0..8).map(|h| h as f32 * 0.3 - 1.0).collect();
    let lens = [150usize, 37];
    let bias_data: Vec<f32> = (0..130 * 200)
        .map(|x| ((x * 7919) % 13) as f32 * 0.1 - 0.6)
        .collect();
    let bias = Tensor::new(&bias_data, [1, 130, 1, 200], [0, 200, 0, 1]).unwrap();
    let mask_data: Vec<bool> = (0..2 * 200).map(|x| (x * 31) % 7 != 0).collect();
    let mask = Tensor::new(&mask_data, [2, 1, 1, 200], [200, 0, 0, 1]).unwrap();
    check(
        2,
        8,
        2,
        130,
        200,
        64,
        64,
        Options::new().sliding_window(20, 5, Alignment::TopLeft),
    );
    check(
        2,
        8,
        2,
        130,
        200,
        64,
        64,
        Options::new()
            .causal(Alignment::BottomRight)
            .sliding_window(30, 0, Alignment::BottomRight),
    );
    check(2, 8, 2, 130, 200, 64, 64, Options::new().kv_lens(&lens));
    check(2, 8, 2, 130, 200, 64, 64, Options::new().bias(bias));
    check(2, 8, 2, 130, 200, 64, 64, Options::new().mask(mask));
    check(
        2,
        8,
        2,
        130,
        200,
        64,
        64,
        Options::new().alibi(&slopes8, Alignment::BottomRight),
    );
    check(2, 8, 2, 130, 200, 64, 64, Options::new().softcap(0.5));
    check(2, 8, 2, 130, 200, 64, 64, Options::new().sinks(&sinks8));
    check(
        2,
        8,
        2,
        130,
        200,
        64,
        64,
        Options::new()
            .sinks(&sinks8)
            .causal(Alignment::TopLeft)
            .kv_lens(&lens)
            .bias(bias)
            .mask(mask)
            .alibi(&slopes8, Alignment::TopLeft)
            .softcap(2.0)
            .sliding_window(50, 3, Alignment::TopLeft),
    );
    // decode shape: split-KV path
    check(
        1,
        8,
        2,
        1,
        5000,
        128,
        128,
        Options::new().causal(Alignment::BottomRight),
    );
    check(
        2,
        8,
        2,
        3,
        4100,
        64,
        32,
        Options::new().sinks(&sinks8).kv_lens(&[4100, 1000]),
    );
}
