"""Running packages: open and validate a folder, generate tokens, benchmark, verify.

Everything here imports onnxruntime, onnxruntime-genai, torch and transformers inside
functions, so ``import engine.runtime`` stays as light as ``import engine``. At run time
the modules need only numpy and onnxruntime (plus onnx for device-side helper graphs),
so they also run in a WebGPU environment where onnxruntime-webgpu replaces onnxruntime.

- :mod:`engine.runtime.package`: a package folder and its genai_config, validated.
- :mod:`engine.runtime.session`: EP name -> onnxruntime session; which provider ran.
- :mod:`engine.runtime.device_io`: device tensors at fixed addresses (graph capture).
- :mod:`engine.runtime.runner`: our generation loop (growing or shared KV, IOBinding,
  graph capture); :mod:`engine.runtime.sampling` chooses tokens.
- :mod:`engine.runtime.genai_runner`: the same through onnxruntime-genai.
- :mod:`engine.runtime.generation`: a generation's tokens and timings; comparisons.
- :mod:`engine.runtime.bench` and :mod:`engine.runtime.bench_record`: benchmarks as
  typed records.
- :mod:`engine.runtime.verify`: a package against transformers on its checkpoint
  (:mod:`engine.runtime.verify_media` with images / audio).
- :mod:`engine.runtime.limits`: lengths and counts a run may ask for, checked up front.
- :mod:`engine.runtime.media`: prompts with images / audio; :mod:`engine.runtime.media_files`
  reads the files' headers and :mod:`engine.runtime.media_fit` checks them against the
  package's processors and encoders before anything loads.
"""
