# mmdeploy-format deploy config: Classification (mmpretrain) for ONNX Runtime,
# static 224x224, batch 1.
# Used by tools/deploy/export_onnx.py --deploy-cfg (docs/deploy.md); opset 17.
onnx_config = dict(
    type='onnx', export_params=True, keep_initializers_as_inputs=False, opset_version=17,
    save_file='end2end.onnx', input_names=['input'], output_names=['cls_score'],
    input_shape=[224, 224])  # input_shape: [W, H], as mmdeploy
codebase_config = dict(type='mmpretrain', task='Classification')
backend_config = dict(type='onnxruntime')
