'use strict'
/**
 * A tiny ONNX writer for the benchmark: the MLP as Gemm (transB=1, PyTorch's Linear layout) and Relu nodes,
 * float32 initializers, a dynamic batch dimension. Protobuf encoded by hand (varints, length-delimited).
 */

function varint (n) {
  const out = []
  let v = BigInt(n)
  do {
    let b = Number(v & 0x7fn)
    v >>= 7n
    if (v) b |= 0x80
    out.push(b)
  } while (v)
  return out
}

const key = (field, wire) => varint((field << 3) | wire)
const bytesField = (field, data) => [...key(field, 2), ...varint(data.length), ...data]
const strField = (field, s) => bytesField(field, [...Buffer.from(s, 'utf8')])
const intField = (field, v) => [...key(field, 0), ...varint(v)]

function tensor (name, dims, f32) {
  // TensorProto: dims=1, data_type=2 (FLOAT=1), name=8, raw_data=9
  return [...dims.flatMap((d) => intField(1, d)), ...intField(2, 1), ...strField(8, name),
    ...bytesField(9, [...new Uint8Array(f32.buffer, f32.byteOffset, f32.byteLength)])]
}

function valueInfo (name, dims) {
  // ValueInfoProto: name=1, type=2 -> TypeProto.tensor_type=1 {elem_type=1, shape=2 {dim=1 {dim_value=1 | dim_param=2}}}
  const shape = dims.flatMap((d) => bytesField(1, typeof d === 'string' ? strField(2, d) : intField(1, d)))
  const tt = [...intField(1, 1), ...bytesField(2, shape)]
  return [...strField(1, name), ...bytesField(2, bytesField(1, tt))]
}

function node (op, inputs, outputs, attrs = []) {
  // NodeProto: input=1, output=2, op_type=4, attribute=5 {name=1, i=3, type=20 (INT=2)}
  return [...inputs.flatMap((i) => strField(1, i)), ...outputs.flatMap((o) => strField(2, o)), ...strField(4, op),
    ...attrs.flatMap(([n, v]) => bytesField(5, [...strField(1, n), ...intField(3, v), ...intField(20, 2)]))]
}

/** layers: [{weight (Float32Array, [out, in]), bias, out, in}] -> ONNX model bytes (opset 13). */
function mlpOnnx (layers) {
  const nodes = []
  const inits = []
  let cur = 'x'
  layers.forEach((l, i) => {
    inits.push(tensor(`w${i}`, [l.out, l.in], l.weight), tensor(`b${i}`, [l.out], l.bias))
    const out = i === layers.length - 1 ? 'logits' : `h${i}`
    nodes.push(node('Gemm', [cur, `w${i}`, `b${i}`], [i === layers.length - 1 ? out : `g${i}`], [['transB', 1]]))
    if (i < layers.length - 1) nodes.push(node('Relu', [`g${i}`], [out]))
    cur = out
  })
  const graph = [...nodes.flatMap((n) => bytesField(1, n)), ...strField(2, 'mlp'), ...inits.flatMap((t) => bytesField(5, t)),
    ...bytesField(11, valueInfo('x', ['batch', layers[0].in])), ...bytesField(12, valueInfo('logits', ['batch', layers[layers.length - 1].out]))]
  // ModelProto: ir_version=1, producer_name=2, graph=7, opset_import=8 {domain=1, version=2}
  return new Uint8Array([...intField(1, 7), ...strField(2, 'polygrad-bench'), ...bytesField(7, graph),
    ...bytesField(8, [...strField(1, ''), ...intField(2, 13)])])
}

module.exports = { mlpOnnx }
